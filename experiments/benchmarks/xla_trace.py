"""Per-thunk times of a jitted XLA CPU computation, mapped back to the Python that emitted them.

    ops = hlo_ops(jitted.lower(*args).compile().as_text())   # instruction name -> HloOp
    arrays = materialized(hlo_text, {"151936,1024"})          # unfused results of a shape
    seconds = trace_thunk_seconds(run, calls)                 # thunk name -> seconds per call

A `jax.profiler` trace of the CPU backend has one event per executed thunk,
named after its HLO instruction (a fusion, a dot, a loop's body ops). The
compiled module's text carries, for every instruction, a stack frame id into
the header tables `FileNames`, `FunctionNames`, `FileLocations` and
`StackFrames`; `hlo_ops` resolves those into the chain of Python functions
that emitted the instruction, which is what benchmarks sort thunk times by.
Thunks inside a `while` loop's body are separate events, one per iteration.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import re
import tempfile
from collections.abc import Callable

import jax


@dataclasses.dataclass
class HloOp:
    """One instruction of the compiled module: what a profiler thunk event is named after."""

    name: str
    opcode: str
    is_dot: bool  # a dot, or a fusion whose body has one
    backward: bool  # emitted by autodiff's transpose (a backward pass)
    functions: tuple[str, ...]  # the Python functions that emitted it, outermost first


def _table(text: str, title: str) -> dict[int, str]:
    """A numbered table of the HLO text's stack-frame header (`FileNames`, …)."""
    match = re.search(rf"^{title}\n(.*?)\n\n", text, re.S | re.M)
    rows = match.group(1).splitlines() if match else []
    return {int(r.split(" ", 1)[0]): r.split(" ", 1)[1] for r in rows}


def _frame_functions(text: str) -> dict[int, tuple[str, ...]]:
    """stack_frame_id -> the function names of its frames, outermost first."""
    functions = {k: v.strip('"') for k, v in _table(text, "FunctionNames").items()}
    locations = {}
    for k, v in _table(text, "FileLocations").items():
        found = re.search(r"function_name_id=(\d+)", v)
        if found:
            locations[k] = int(found.group(1))
    frames = {}
    for k, v in _table(text, "StackFrames").items():
        loc, parent = (int(x) for x in re.findall(r"=(\d+)", v)[:2])
        frames[k] = (loc, parent - 1)  # the table's parent_frame_id is the parent's id + 1

    def chain(frame: int) -> tuple[str, ...]:
        names = []
        while frame in frames and len(names) < 64:
            loc, frame = frames[frame]
            if loc in locations:
                names.append(functions.get(locations[loc], "?"))
        return tuple(reversed(names))

    return {k: chain(k) for k in frames}


_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%([\w.\-]+) = .*? ([a-z][\w\-]*)\(")


def hlo_ops(text: str) -> dict[str, HloOp]:
    """Every instruction of compiled HLO `text` (`compiled.as_text()`), by name."""
    frames = _frame_functions(text)
    bodies: dict[str, str] = {}
    for block in re.split(r"\n\n", text):
        head = re.match(r"^(?:ENTRY )?%([\w.\-]+) ", block)
        if head:
            bodies[head.group(1)] = block
    ops = {}
    for line in text.splitlines():
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        name, opcode = m.groups()
        calls = re.search(r"calls=%([\w.\-]+)", line)
        body = bodies.get(calls.group(1), "") if calls else ""
        op_name = re.search(r'op_name="([^"]*)"', line)
        frame = re.search(r"stack_frame_id=(\d+)", line)
        ops[name] = HloOp(
            name=name,
            opcode=opcode,
            is_dot=opcode == "dot" or " dot(" in body,
            backward="transpose(" in (op_name.group(1) if op_name else ""),
            functions=frames.get(int(frame.group(1)), ()) if frame else (),
        )
    return ops


def trace_thunk_seconds(run: Callable[[], object], calls: int) -> dict[str, float]:
    """Seconds per call of `run` spent in each XLA thunk (by HLO instruction name), from a
    profiler trace of `calls` calls (`run` must block until its results are ready)."""
    from jax.profiler import ProfileData

    with tempfile.TemporaryDirectory() as logdir:
        with jax.profiler.trace(logdir):
            for _ in range(calls):
                run()
        (path,) = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
        data = ProfileData.from_file(path)
    seconds: dict[str, float] = collections.defaultdict(float)
    for plane in data.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if line.name == "python":
                continue
            for event in line.events:
                seconds[event.name] += event.duration_ns * 1e-9 / calls
    return dict(seconds)


def materialized(hlo: str, shapes: set[str]) -> list[str]:
    """Instructions outside fused computations whose result has one of `shapes`
    (dimensions as HLO writes them, "151936,1024"), other than parameters, tuple
    elements and bitcasts: the arrays of that shape the compiled code writes.
    (Inside a fusion an operand-sized op need not be written: a convert fused
    into a slice converts only the slice.)"""
    fused = set(re.findall(r"calls=%([\w.\-]+)", hlo))
    found, computation = [], None
    for line in hlo.splitlines():
        header = re.match(r"^(?:ENTRY )?%([\w.\-]+) ", line)
        if header and line.rstrip().endswith("{"):
            computation = header.group(1)
            continue
        if computation is None or computation in fused:
            continue
        op = re.match(r"^\s+(?:ROOT )?%[\w.\-]+ = \w+\[([\d,]*)\]\{[\d,]*\} ([\w\-]+)\(", line)
        if op and op.group(1) in shapes:
            if op.group(2) not in ("parameter", "get-tuple-element", "bitcast", "tuple"):
                found.append(line.strip()[:160])
    return found
