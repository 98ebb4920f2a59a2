"""The installed deltasync package: exceptions, stubs, the shipped CLI.

Needs `pip install .` first (scripts/test.sh does it).
"""
import ast
import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import deltasync
from deltasync import _native

PKG = Path(deltasync.__file__).resolve().parent

# deltasync::ErrorCodeName -> the Python class the native module raises.
CODES = {
    "invalid argument": deltasync.InvalidArgumentError,
    "not found": deltasync.NotFoundError,
    "corruption": deltasync.CorruptionError,
    "integrity": deltasync.IntegrityError,
    "io error": deltasync.StoreIOError,
    "unsupported": deltasync.UnsupportedError,
    "conflict": deltasync.ConflictError,
    "failed precondition": deltasync.FailedPreconditionError,
    "internal": deltasync.InternalError,
}


def test_version_and_public_names():
    assert deltasync.__version__ == "0.1.0"
    for name in deltasync.__all__:
        assert hasattr(deltasync, name), name
    assert PKG.name == "deltasync"
    assert Path(_native.__file__).resolve().parent == PKG


@pytest.mark.parametrize("code", sorted(CODES))
def test_native_errors_map_to_python_classes(code):
    cls = CODES[code]
    with pytest.raises(cls) as info:
        _native._raise(code, f"something about {code}")
    err = info.value
    assert type(err) is cls
    assert isinstance(err, deltasync.Error)
    assert err.code == code
    assert str(err) == f"something about {code}"
    assert err.message == f"something about {code}"


def test_error_hierarchy():
    assert issubclass(deltasync.InvalidArgumentError, ValueError)
    assert issubclass(deltasync.NotFoundError, LookupError)
    assert len({cls.code for cls in CODES.values()}) == len(CODES)
    for cls in CODES.values():
        assert issubclass(cls, deltasync.Error) and issubclass(cls, Exception)


def test_unknown_error_code_is_invalid_argument():
    with pytest.raises(deltasync.InvalidArgumentError, match="unknown error code"):
        _native._raise("nonsense", "x")


def test_type_stubs_shipped_and_match_the_native_module():
    assert (PKG / "py.typed").is_file()
    stub = PKG / "_native.pyi"
    assert stub.is_file()
    tree = ast.parse(stub.read_text())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    assert {"Publisher", "Replica"} <= set(classes)
    for cls_name, node in classes.items():
        native_cls = getattr(_native, cls_name)
        stubbed = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
        public = {n for n in dir(native_cls) if not n.startswith("_")}
        assert stubbed - {"__init__"} == public, f"{cls_name}: stub {sorted(stubbed)} vs native {sorted(public)}"
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    for name in functions:
        assert callable(getattr(_native, name)), name


def test_public_signatures_follow_the_contract():
    sig = inspect.signature(deltasync.Publisher)
    # The four bucket settings default to None: the bucket's stored values.
    for kw, default in [("anchor_interval", None), ("encoding", None), ("cumulative_interval", None),
                        ("anchor_max_fraction", None), ("change_settings", False), ("allow_version_jump", False),
                        ("threads", 0), ("allow_nonfinite", False),
                        ("create_bucket", False), ("notify", ()), ("notify_token", ""), ("max_pending", 2)]:
        assert sig.parameters[kw].default == default, kw
        assert sig.parameters[kw].kind is inspect.Parameter.KEYWORD_ONLY
    assert inspect.signature(deltasync.Replica).parameters["threads"].default == 0
    assert inspect.signature(deltasync.Replica.update).parameters["version"].default is None


def test_the_split_modules_keep_their_public_names():
    """deltasync.torch and deltasync.vllm are split by role into private modules: every public
    name stays importable from the module the docs name (re-exported), and Publisher keeps the
    background queue's methods (_publish_queue.py)."""
    for name in ("publish", "publish_changes", "publish_dir", "state_tensors", "raise_failure", "flush",
                 "close", "pending", "latest_version", "settings", "changed_settings", "degraded"):
        assert hasattr(deltasync.Publisher, name), f"Publisher.{name}"
    pytest.importorskip("torch")
    extra = {"deltasync.torch": ["KEEP_FP32_SUFFIXES", "strip_wrapper_prefix"], "deltasync.vllm": []}
    for module_name, names in extra.items():
        module = importlib.import_module(module_name)
        for name in [*module.__all__, *names]:
            assert getattr(module, name, None) is not None, f"{module_name}.{name}"


def test_cli_binary_is_installed_in_the_package():
    binary = PKG / "bin" / "deltasync"
    assert binary.is_file() and os.access(binary, os.X_OK)


def _module_cli(*args):
    return subprocess.run([sys.executable, "-m", "deltasync", *args], capture_output=True, text=True, timeout=120)


def test_python_m_deltasync_help():
    proc = _module_cli("--help")
    assert proc.returncode == 0, proc.stderr
    assert "Usage" in proc.stdout and "publish" in proc.stdout


def test_python_m_deltasync_usage_error_exits_2():
    proc = _module_cli("no-such-subcommand")
    assert proc.returncode == 2
    assert "deltasync" in proc.stderr


def test_python_m_deltasync_error_exits_1(tmp_path):
    proc = _module_cli("inspect", str(tmp_path / "missing.safetensors"))
    assert proc.returncode == 1
    assert proc.stderr.startswith("deltasync: error:")


def test_python_m_deltasync_pulls_what_python_published(tmp_path):
    np = pytest.importorskip("numpy")
    bucket = str(tmp_path / "b")
    w = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    with deltasync.Publisher(bucket) as pub:
        pub.publish(1, {"w": w})
    out = tmp_path / "pulled.safetensors"
    proc = _module_cli("pull", bucket, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 64 * 2
