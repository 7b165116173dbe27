"""CUDA graphs for the engine, in one place (docs/STYLE.md convention 10).

Owns: capturing a piece of the engine (a round, a block's start or end, a whole block) into a
`torch.cuda.CUDAGraph` after a warm-up, and the device-side WHILE loop that lets a whole block
run in one launch: a CUDA conditional node built through ``cuda.bindings`` inside a torch capture
(docs/engine.md 4.4; NVIDIA NeMo's recipe). torch 2.11 has no Python API for
conditional nodes, so the node is added to the graph torch is capturing:

  1. the capturing ``cudaGraph_t`` comes from ``cudaStreamGetCaptureInfo``; a conditional handle
     is created on it;
  2. a one-thread NVRTC kernel copies a device bool into the handle (``cudaGraphSetConditional``),
     before the loop (enter?) and at the end of the body (again?);
  3. a ``CU_GRAPH_NODE_TYPE_CONDITIONAL`` / WHILE node is added and made the capture dependency;
  4. the body is captured on a side stream with ``cudaStreamBeginCaptureToGraph``; its
     temporaries come from a dedicated `torch.cuda.MemPool` (the body stream is not the stream
     torch is capturing, so torch's graph pool would not serve it), kept alive with this object.
Everything the graphs read or write between launches lives in the caller's static buffers: the
host copies inputs in before a launch and copies outputs out after it; eager execution of the
same Python functions is one flag away (`orl.engine.runtime.EngineConfig.mode`).
Does not own: what the captured functions compute (`orl.engine.runtime`).
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch

_SETTER_SRC = r"""
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle,
                                                                      unsigned int value);
extern "C" __global__ void orl_while_setter(cudaGraphConditionalHandle handle, const bool* flag)
{
    cudaGraphSetConditional(handle, *flag ? 1u : 0u);
}
"""


def _code(err) -> int:
    try:
        return int(err)
    except TypeError:
        return int(err.value)


def _ok(result):
    """Unpack a cuda.bindings result tuple (error first), raising on failure."""
    err, *rest = result
    if _code(err) != 0:
        raise RuntimeError(f"CUDA call failed: {err!r}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def conditional_nodes_available() -> tuple[bool, str]:
    """(True, "") when a device WHILE loop can be built here, else (False, why)."""
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    try:
        from cuda.bindings import driver  # noqa: PLC0415
    except ImportError:
        return False, "cuda.bindings (cuda-python) is not installed"
    ver = _ok(driver.cuDriverGetVersion())
    if ver < 12040:
        return False, f"the driver supports CUDA {ver // 1000}.{ver % 1000 // 10}; conditional nodes need 12.4"
    return True, ""


def capture(fn: Callable[[], None], stream: torch.cuda.Stream, warmup: bool = True, pool=None) -> torch.cuda.CUDAGraph:
    """Capture ``fn()`` (which must only touch static buffers) into a CUDA graph on ``stream``.
    The warm-up call runs ``fn`` once eagerly on the same stream first (kernel loading, cuBLAS
    workspaces, compilation); callers restore any state it changed. Graphs whose results all go
    to static buffers may share one memory ``pool`` (their temporaries are dead between launches
    and they never run concurrently), so many captured graphs cost one set of temporaries."""
    if warmup:
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool, stream=stream, capture_error_mode="thread_local"):
        fn()
    torch.cuda.synchronize()
    return g


class WhileLoop:
    """Builds device-side WHILE loops inside torch captures (see module docstring).

    ``body_stream`` is where body ops are captured; warm the body up on it before capturing
    (cuBLAS workspaces are per stream)."""

    def __init__(self, device: torch.device):
        ok, why = conditional_nodes_available()
        if not ok:
            raise RuntimeError(f"device WHILE loops unavailable: {why}")
        from cuda.bindings import __version__ as version  # noqa: PLC0415
        self._cuda13 = int(version.split(".")[0]) >= 13
        self.device = device
        self.body_stream = torch.cuda.Stream(device)
        self.body_pool = torch.cuda.MemPool()
        self._keep: list = []  # argument arrays of captured launches
        self._fn = self._compile_setter()

    def _compile_setter(self):
        import numpy as np  # noqa: PLC0415
        from cuda.bindings import driver as cu, nvrtc  # noqa: PLC0415
        torch.zeros(1, device=self.device)  # the primary context must exist for cuModuleLoadData
        prog = _ok(nvrtc.nvrtcCreateProgram(_SETTER_SRC.encode(), b"orl_while.cu", 0, [], []))
        major, minor = torch.cuda.get_device_capability(self.device)
        opts = [f"--gpu-architecture=compute_{major}{minor}".encode()]
        err, = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if _code(err) != 0:
            size = _ok(nvrtc.nvrtcGetProgramLogSize(prog))
            log = bytearray(size)
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"NVRTC failed to compile the WHILE setter: {bytes(log).decode(errors='replace')}")
        size = _ok(nvrtc.nvrtcGetPTXSize(prog))
        ptx = bytearray(size)
        _ok(nvrtc.nvrtcGetPTX(prog, ptx))
        self._ptx = np.char.array(bytes(ptx))
        module = _ok(cu.cuModuleLoadData(self._ptx.ctypes.data))
        self._module = module
        return _ok(cu.cuModuleGetFunction(module, b"orl_while_setter"))

    def _set(self, handle, flag: torch.Tensor, stream: torch.cuda.Stream) -> None:
        import numpy as np  # noqa: PLC0415
        from cuda.bindings import driver as cu  # noqa: PLC0415
        ptr = np.array([flag.data_ptr()], dtype=np.uint64)
        args = np.array([handle.getPtr(), ptr.ctypes.data], dtype=np.uint64)
        self._keep += [ptr, args, handle]
        _ok(cu.cuLaunchKernel(self._fn, 1, 1, 1, 1, 1, 1, 0, stream.cuda_stream, args.ctypes.data, 0))

    @contextlib.contextmanager
    def loop(self, flag: torch.Tensor):
        """Inside a `torch.cuda.graph` capture: the ops issued in the ``with`` block become the body
        of a device WHILE loop. The body runs iff ``flag`` ((1,) bool, device) is True here, and
        again as long as it is True at the end of the body (the body must update it)."""
        from cuda.bindings import driver as cu, runtime as rt  # noqa: PLC0415
        outer = torch.cuda.current_stream(self.device)
        info = _ok(rt.cudaStreamGetCaptureInfo(outer.cuda_stream))
        if info[0] != rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusActive:
            raise RuntimeError("WhileLoop.loop must be used inside a torch.cuda.graph capture")
        graph = info[2]
        handle = _ok(rt.cudaGraphConditionalHandleCreate(graph, 0, 0))
        self._set(handle, flag, outer)
        info = _ok(rt.cudaStreamGetCaptureInfo(outer.cuda_stream))
        deps = list(info[3] or [])
        params = cu.CUgraphNodeParams()
        params.type = cu.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
        params.conditional.handle = handle
        params.conditional.type = cu.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE
        params.conditional.size = 1
        params.conditional.ctx = _ok(cu.cuCtxGetCurrent())
        set_deps = rt.cudaStreamUpdateCaptureDependenciesFlags.cudaStreamSetCaptureDependencies
        if self._cuda13:  # CUDA 13 added edgeData arguments
            node = _ok(cu.cuGraphAddNode(graph, deps, None, len(deps), params))
            _ok(rt.cudaStreamUpdateCaptureDependencies(outer.cuda_stream, [node], None, 1, set_deps))
        else:
            node = _ok(cu.cuGraphAddNode(graph, deps, len(deps), params))
            _ok(rt.cudaStreamUpdateCaptureDependencies(outer.cuda_stream, [node], 1, set_deps))
        body = params.conditional.phGraph_out[0]
        bs = self.body_stream
        _ok(rt.cudaStreamBeginCaptureToGraph(bs.cuda_stream, body, None, None, 0,
                                             rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal))
        active = True
        torch.cuda.set_stream(bs)
        try:
            with torch.cuda.use_mem_pool(self.body_pool):
                yield
            self._set(handle, flag, bs)
            active = False
            _ok(rt.cudaStreamEndCapture(bs.cuda_stream))
        finally:
            if active:
                rt.cudaStreamEndCapture(bs.cuda_stream)
            torch.cuda.set_stream(outer)
