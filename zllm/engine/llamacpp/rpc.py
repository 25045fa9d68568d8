"""llama.cpp RPC: a GGUF's layers on `rpc-server`s on other machines (llama.cpp's own distributed path, what
`llama-server --rpc` does), registered before the model loads.

    register_rpc_servers(("10.0.0.2:50052", "10.0.0.3:50052"), backend_path="")
    with load_log() as lines:           # llama.cpp's own account of where the weights went
        ...load the model...            # layers go to every registered RPC device first, the rest stay here
    placement(lines)                    # "CPU 54 MiB, RPC0[10.0.0.2:50052] 108 MiB, RPC0[10.0.0.3:50052] 149 MiB"

llama-cpp-python's `rpc_servers=` parameter is ignored by the llama.cpp it vendors: registration is ggml's
backend registry, reached by ctypes through libllama's own handle (llama_cpp._ggml opens a second copy of
libggml whose registry libllama never reads). The RPC backend is there when llama-cpp-python was built with
-DGGML_RPC=ON; otherwise `backend_path` names a libggml-rpc.so module that .ci/llama-rpc built against this
very install (its llama-rpc.json must name the running libggml-base: a module of another ggml would share
structs it does not agree with).

Registration is process-wide and for good (ggml has no unregister), and ggml aborts the process when a server
it is connected to goes away or never answers. So each server is checked here first with llama.cpp's RPC
handshake, under a timeout: a server that is down, busy with another client (rpc-server serves one at a time)
or speaks another protocol version is a clear error, not a dead or hung daemon.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import re
import socket
import struct
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import llama_cpp as lc
import llama_cpp.llama_cpp as llama_lib

from zllm.errors import ConfigError

log = logging.getLogger("zllm.engine")

# ggml-rpc.h and transport.h of the llama.cpp llama-cpp-python 0.3.36 vendors (pyproject pins it)
RPC_PROTO_MAJOR = 7
RPC_CMD_HELLO = 14
RPC_CONN_CAPS_SIZE = 24
HANDSHAKE_TIMEOUT_S = 5.0
BUILD_RECORD = "llama-rpc.json"  # written by .ci/llama-rpc beside the module
REBUILD = ('rebuild llama-cpp-python with the RPC backend: CMAKE_ARGS="-DGGML_RPC=ON" pip install '
           f"--force-reinstall --no-cache-dir --no-binary llama-cpp-python llama-cpp-python=={lc.__version__} "
           '(README: "a GGUF over llama.cpp RPC"), or point --rpc-backend at a libggml-rpc.so that .ci/llama-rpc '
           "built for this install")

_registered: dict[str, str] = {}  # endpoint → its device names, for this process (registration is for good)


def parse_endpoints(raw: Sequence[str]) -> tuple[str, ...]:
    """HOST:PORT items, checked (llama.cpp aborts on one it cannot parse; it splits at the first colon, so an
    IPv6 address is not one)."""
    endpoints = tuple(item.strip() for item in raw if item.strip())
    for endpoint in endpoints:
        host, _, port = endpoint.partition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--rpc takes HOST:PORT items, comma-separated; {endpoint!r} is not one",
                              hint="e.g. --rpc 10.0.0.2:50052,10.0.0.3:50052 (rpc-server's --host and --port; "
                                   "llama.cpp's RPC takes no IPv6 address: use a host name)")
    return endpoints


def register_rpc_servers(endpoints: Sequence[str], *, backend_path: str = "") -> list[str]:
    """Register each server's devices with ggml (after its handshake), so the next model load puts layers on
    them. Returns the devices' names ("RPC0", ...) in llama.cpp's placement order."""
    endpoints = parse_endpoints(endpoints)
    if not endpoints:
        return []
    ggml = _ggml()
    add_server = _add_server_function(ggml, _rpc_registry(ggml, backend_path))
    for endpoint in endpoints:
        if endpoint in _registered:
            continue
        version = handshake(endpoint)
        server = add_server(endpoint.encode())
        if not server:
            raise ConfigError(f"the RPC server at {endpoint} reports no devices")
        ggml.ggml_backend_register(server)
        names = [ggml.ggml_backend_dev_name(ggml.ggml_backend_reg_dev_get(server, i)).decode()
                 for i in range(ggml.ggml_backend_reg_dev_count(server))]
        _registered[endpoint] = ",".join(names)
        log.info("llama.cpp RPC: %s (protocol %d.%d.%d) registered as %s", endpoint, *version, _registered[endpoint])
    return [name for endpoint in endpoints for name in _registered[endpoint].split(",")]


def handshake(endpoint: str, timeout: float = HANDSHAKE_TIMEOUT_S) -> tuple[int, int, int]:
    """llama.cpp's RPC HELLO (| cmd: 1 byte | size: u64 | connection caps |) on a connection of our own; the
    server's protocol version. rpc-server serves the next client when this one closes."""
    host, _, port = endpoint.partition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            # closed with a reset, not a FIN: a busy rpc-server accepts this connection later, and answering a
            # HELLO whose client has gone kills it with SIGPIPE; after a reset its read fails and it serves on
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.sendall(struct.pack("<BQ", RPC_CMD_HELLO, RPC_CONN_CAPS_SIZE) + bytes(RPC_CONN_CAPS_SIZE))
            (size,) = struct.unpack("<Q", _receive(sock, 8))
            if size != 4 + RPC_CONN_CAPS_SIZE:
                raise ConfigError(f"{endpoint} did not answer llama.cpp's RPC handshake like an rpc-server "
                                  f"({size}-byte answer)", hint="is it an rpc-server of the same llama.cpp?")
            major, minor, patch = _receive(sock, size)[:3]
    except TimeoutError:
        raise ConfigError(f"the RPC server at {endpoint} did not answer llama.cpp's RPC handshake in {timeout:g} s",
                          hint="an rpc-server serves one client at a time: is another zllm or llama.cpp using it?"
                          ) from None
    except OSError as exc:
        raise ConfigError(f"cannot reach the RPC server at {endpoint}: {exc.strerror or exc}",
                          hint="start `ggml-rpc-server --host ADDR --port PORT` on that machine (README: "
                               '"a GGUF over llama.cpp RPC")') from None
    if major != RPC_PROTO_MAJOR:
        raise ConfigError(f"the RPC server at {endpoint} speaks llama.cpp RPC {major}.{minor}.{patch}; this "
                          f"llama-cpp-python speaks {RPC_PROTO_MAJOR}.x",
                          hint=f"build rpc-server from the llama.cpp llama-cpp-python {lc.__version__} vendors")
    return major, minor, patch


def _receive(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError(0, "the connection closed during the handshake")
        data += chunk
    return data


def _rpc_registry(ggml, backend_path: str) -> int:
    """The RPC backend's registry entry: built in, or loaded from `backend_path` once its build record says it
    was built against the ggml this process runs."""
    reg = ggml.ggml_backend_reg_by_name(b"RPC")
    if reg:
        return reg
    if not backend_path:
        raise ConfigError(f"this llama-cpp-python ({lc.__version__}) was built without llama.cpp's RPC backend",
                          hint=REBUILD)
    _check_build_record(Path(backend_path))
    reg = ggml.ggml_backend_load(str(backend_path).encode())
    if not reg:
        raise ConfigError(f"ggml could not load the RPC backend {backend_path} (its log above says why)", hint=REBUILD)
    return reg


def _check_build_record(module: Path) -> None:
    record = module.with_name(BUILD_RECORD)
    if not module.is_file() or not record.is_file():
        raise ConfigError(f"--rpc-backend {module}: no such module with its {BUILD_RECORD} beside it", hint=REBUILD)
    built_for = json.loads(record.read_text()).get("libggml_base_sha256")
    running = hashlib.sha256(_libggml_base().read_bytes()).hexdigest()
    if built_for != running:
        raise ConfigError(f"--rpc-backend {module} was built against another libggml-base than this "
                          f"llama-cpp-python's ({_libggml_base()})", hint="run .ci/llama-rpc again for this install")


def _libggml_base() -> Path:
    """The libggml-base libllama loads (its RUNPATH is its own directory)."""
    return Path(lc.__file__).parent / "lib" / "libggml-base.so.0"


def _add_server_function(ggml, reg: int):
    address = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    if not address:
        raise ConfigError("this build's RPC backend has no ggml_backend_rpc_add_server", hint=REBUILD)
    return ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(address)


def _ggml():
    """ggml's registry functions, looked up through libllama's handle: the libggml libllama itself uses."""
    pointer, text, size = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
    return SimpleNamespace(**{name: _function(name, restype, argtypes) for name, restype, argtypes in (
            ("ggml_backend_reg_by_name", pointer, [text]),
            ("ggml_backend_load", pointer, [text]),
            ("ggml_backend_register", None, [pointer]),
            ("ggml_backend_reg_get_proc_address", pointer, [pointer, text]),
            ("ggml_backend_reg_dev_count", size, [pointer]),
            ("ggml_backend_reg_dev_get", pointer, [pointer, size]),
            ("ggml_backend_dev_name", text, [pointer]))})


def _function(name: str, restype, argtypes):
    """A function of libllama's handle as an object of our own: `_lib[name]` is a new one each time, where
    `_lib.name` is the one llama-cpp-python declared (its argument types are not ours to change)."""
    function = llama_lib._lib[name]
    function.restype, function.argtypes = restype, argtypes
    return function


# ---------------------------------------------------------------------------------- where the weights went


@contextmanager
def load_log() -> Iterator[list[str]]:
    """llama.cpp's log lines while the block runs (a model load), collected instead of printed; errors still go
    to stderr. The callback llama-cpp-python installed is put back after."""
    lines: list[str] = []
    previous, previous_data = ctypes.c_void_p(), ctypes.c_void_p()
    pointer = ctypes.c_void_p
    _function("llama_log_get", None, [ctypes.POINTER(pointer), ctypes.POINTER(pointer)])(
        ctypes.byref(previous), ctypes.byref(previous_data))

    @lc.llama_log_callback
    def collect(level: int, text: bytes, _data) -> None:
        line = text.decode(errors="replace")
        lines.append(line)
        if level == 3:  # GGML_LOG_LEVEL_ERROR
            print(line, end="", file=sys.stderr, flush=True)

    set_log = _function("llama_log_set", None, [pointer, pointer])
    set_log(ctypes.cast(collect, pointer), None)
    try:
        yield lines
    finally:
        set_log(previous, previous_data)


def placement(lines: Sequence[str]) -> str:
    """"RPC0[host:port] 120 MiB, ..., CPU 28 MiB": the model buffers per device, as llama.cpp logged them while
    loading (its "offloaded N/M layers" line counts the layers asked for, not the ones a device took)."""
    found = re.findall(r"(\S+) model buffer size = +([\d.]+) MiB", "".join(lines))
    return ", ".join(f"{device.removesuffix('_Mapped')} {float(mib):.0f} MiB" for device, mib in found)
