"""The harness's own access to the bucket: read the manifest, damage objects
(a damaged copy renamed over the object, never an edit in place), and find
temporary files. A local directory directly; S3 through curl's SigV4."""
import json
import os
import re
import subprocess
import tempfile

TEMP_NAME = re.compile(r"(^|/)\.tmp[-\\]")


def is_temporary(path):
    return TEMP_NAME.search(path) is not None


def temporaries_under(root):
    """Paths of temporary entries (files, folders, links) anywhere under root."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            if name.startswith(".tmp-") or name.startswith(".tmp\\"):
                found.append(os.path.join(dirpath, name))
    return found


class LocalBucket:
    def __init__(self, path, scratch):
        self.root = os.path.abspath(path)
        self.url = self.root
        self.scratch = scratch
        os.makedirs(self.root, exist_ok=True)

    def manifest(self):
        try:
            with open(os.path.join(self.root, "manifest.json"), "rb") as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None

    def get(self, key):
        try:
            with open(os.path.join(self.root, key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def replace(self, key, data):
        fd, tmp = tempfile.mkstemp(dir=self.scratch, prefix="damaged-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.rename(tmp, os.path.join(self.root, key))  # same file system: atomic

    def delete(self, key):
        try:
            os.unlink(os.path.join(self.root, key))
        except FileNotFoundError:
            pass

    def temporaries(self):
        return temporaries_under(self.root)


class S3Bucket:
    """s3://bucket/prefix on AWS_ENDPOINT_URL (path-style), keys from AWS_*."""

    def __init__(self, url, scratch):
        m = re.fullmatch(r"s3://([^/]+)/?(.*)", url)
        if not m:
            raise SystemExit(f"--bucket {url}: expected s3://bucket/prefix")
        self.url, self.name, self.prefix = url, m.group(1), m.group(2).strip("/")
        self.scratch = scratch
        self.endpoint = os.environ["AWS_ENDPOINT_URL"].rstrip("/")
        region = os.environ.get("AWS_REGION", "us-east-1")
        self.auth = ["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "--aws-sigv4", f"aws:amz:{region}:s3",
                     "--user", f"{os.environ['AWS_ACCESS_KEY_ID']}:{os.environ['AWS_SECRET_ACCESS_KEY']}"]
        self.root = None

    def _url(self, key):
        return f"{self.endpoint}/{self.name}/{self.prefix + '/' if self.prefix else ''}{key}"

    def _curl(self, *args, timeout=20):
        return subprocess.run(["curl", "-sS", "--max-time", str(timeout), "-w", "%{http_code}", *self.auth, *args],
                              capture_output=True, timeout=timeout + 5)

    def get(self, key):
        out = os.path.join(self.scratch, "get.tmp")
        r = self._curl("-o", out, self._url(key))
        code = r.stdout.decode()[-3:]
        if code == "404":
            return None
        if code != "200":
            raise IOError(f"GET {key}: HTTP {code} {r.stderr.decode().strip()}")
        with open(out, "rb") as f:
            return f.read()

    def manifest(self):
        data = self.get("manifest.json")
        return None if data is None else json.loads(data)

    def replace(self, key, data):  # a PUT replaces an object atomically
        path = os.path.join(self.scratch, "put.tmp")
        with open(path, "wb") as f:
            f.write(data)
        r = self._curl("-T", path, self._url(key))
        if r.stdout.decode()[-3:] != "200":
            raise IOError(f"PUT {key}: {r.stdout.decode()[-3:]} {r.stderr.decode().strip()}")

    def delete(self, key):
        r = self._curl("-X", "DELETE", self._url(key))
        if r.stdout.decode()[-3:] not in ("204", "200", "404"):
            raise IOError(f"DELETE {key}: {r.stdout.decode()[-3:]} {r.stderr.decode().strip()}")

    def temporaries(self):
        """Open multipart uploads under the prefix (S3's temporaries)."""
        r = self._curl(f"{self.endpoint}/{self.name}?prefix={self.prefix}&uploads=")  # SigV4 wants sorted parameters
        body, code = r.stdout.decode()[:-3], r.stdout.decode()[-3:]
        if code != "200":
            raise IOError(f"list multipart uploads: HTTP {code} {body[:200]}")
        return re.findall(r"<Key>([^<]*)</Key>", body)


def open_bucket(url, scratch):
    return S3Bucket(url, scratch) if url.startswith("s3://") else LocalBucket(url, scratch)
