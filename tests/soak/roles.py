"""The soak's child processes that use the Python package: a publisher (a
`deltasync.Publisher` fed by the synthetic trainer) and a replica (a
`deltasync.Replica` that reports the bytes it holds). Each prints one JSON
object per line on stdout; the harness reads them."""
import json
import random
import sys
import threading
import time

import numpy as np

import deltasync
from model import Trainer, canon_hash


_say_lock = threading.Lock()


def say(**fields):
    with _say_lock:  # a background publish reports from the worker thread
        print(json.dumps(fields), flush=True)


def publisher(args):
    trainer = Trainer(args.seed)
    try:
        pub = deltasync.Publisher(args.bucket, anchor_interval=args.anchor_interval,
                                  cumulative_interval=args.cumulative_every, threads=1)
        version = pub.latest_version + 1
        say(opened=pub.latest_version)
        futures = []
        while version <= args.upto:
            if args.background:
                fut = pub.publish(version, trainer.tensors(version), background=True)
                fut.add_done_callback(lambda f, v=version: f.exception() or say(published=v))
                futures.append(fut)
            else:
                pub.publish(version, trainer.tensors(version))
                say(published=version)
            version += 1
            time.sleep(args.pace)
        pub.close()
    except deltasync.Error as e:
        say(error=str(e), code=e.code)
        sys.exit(3)


def replica(args):
    random.seed(args.seed)
    while True:  # a store failure at start (radosgw down) is retried; anything else ends the process
        try:
            rep = deltasync.Replica(args.bucket, threads=1)
            break
        except deltasync.StoreIOError:
            time.sleep(0.5)
        except deltasync.Error as e:
            say(error=str(e), code=e.code)
            sys.exit(3)
    held, bad, last_error = 0, [], None
    while True:
        try:
            latest = rep.latest_available()
            if rep.version and latest > rep.version + 1 and random.random() < 0.5:
                # a lagging replica: stop on an older version, the way a slow engine does
                rep.update(random.randint(rep.version + 1, latest))
            else:
                rep.update()
            error = None
        except deltasync.Error as e:
            error = (str(e), e.code)
        now_bad = sorted(b["key"] for b in rep.bad_objects)
        if rep.version != held or now_bad != bad or error != last_error:
            held, bad, last_error = rep.version, now_bad, error
            digest = canon_hash({n: a.view(np.uint16) for n, a in rep.tensors().items()}) if held else None
            say(version=held, sha=digest, bad=[{"key": b["key"], "version": b["version"]} for b in rep.bad_objects],
                error=error and error[0], code=error and error[1])
        time.sleep(args.pace if random.random() < 0.9 else random.uniform(1, 4))  # sometimes a slow engine
