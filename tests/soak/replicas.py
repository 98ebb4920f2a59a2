"""Reading what a `serve` daemon exports: its `--out DIR` (latest.json and the
file or folder it names) and its `--shm` region (layout version 1, docs/shm.md,
read with the seqlock protocol). Each returns (version, canon_hash) or None
when there is nothing consistent to read right now."""
import json
import mmap
import os
import struct

from model import canon_hash, read_safetensors_hash


def read_out_dir(out_dir, skip_version=None):
    try:
        with open(os.path.join(out_dir, "latest.json")) as f:
            latest = json.load(f)
        if latest["version"] == skip_version:
            return None
        meta, digest = read_safetensors_hash(os.path.join(out_dir, latest["file"]))
    except FileNotFoundError:  # nothing yet, or pruned while being read
        return None
    if meta.get("model_version") != str(latest["version"]):
        raise AssertionError(f"{out_dir}: latest.json says version {latest['version']} but "
                             f"{latest['file']} says model_version {meta.get('model_version')}")
    return latest["version"], digest


def read_shm(name, skip_version=None, tries=50):
    try:
        fd = os.open(f"/dev/shm/{name}", os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size < 256:
            return None
        region = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        if region[0:8] != b"DSYNCSHM":
            return None
        (layout,) = struct.unpack_from("<I", region, 8)
        if layout != 1:
            raise AssertionError(f"shm {name}: layout_version {layout}")
        count, table, entry_bytes = struct.unpack_from("<QQQ", region, 80)
        entries = []
        for i in range(count):
            e = table + i * entry_bytes
            name_off, name_len = struct.unpack_from("<QI", region, e)
            data_off, data_len = struct.unpack_from("<QQ", region, e + 24)
            entries.append((region[name_off:name_off + name_len].decode(), data_off, data_len))
        for _ in range(tries):
            (s1,) = struct.unpack_from("<Q", region, 16)
            if s1 % 2:
                continue
            (version,) = struct.unpack_from("<Q", region, 24)
            if version == skip_version:
                return None
            named = {n: region[o:o + length] for n, o, length in entries}
            (s2,) = struct.unpack_from("<Q", region, 16)
            if s1 == s2:
                return (version, canon_hash(named)) if version else None
        return None
    finally:
        region.close()
