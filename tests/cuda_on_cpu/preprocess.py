"""Source rewrites that let the host compiler build the CUDA sources (tests/cuda_on_cpu).

g++ cannot parse `kernel<<<grid, block, smem, stream>>>(args)` nor give `__shared__` its per-block meaning,
so each .cu / .cuh is rewritten before it is compiled:

  k<T><<<g, b, s, st>>>(x, y)  ->  ::rlk_sim::launch("k<T>", "file.cu:12", &k<T>, g, b, s, st, x, y)
  __shared__ T name[N];        ->  static char tag; auto& name = ::rlk_sim::block_shared_as<T[N]>(&tag);
  extern __shared__ T name[];  ->  T* name = ::rlk_sim::dynamic_shared_as<T>();

Each rewrite keeps the line count, and a #line directive names the original file, so that compiler errors
and the harness's messages point into csrc/. The CUDA bindings (*_binding.cpp) register into the sim's own
library: `TORCH_LIBRARY_IMPL(rlkernels, CUDA, m)` -> `TORCH_LIBRARY_IMPL(rlkernels_sim, CPU, m)`.
Anything the rewrites do not recognize fails here or at compile time, never silently.
"""

from __future__ import annotations

import re

# Lines every rewritten .cu starts with: what nvcc defines and includes before the source. __CUDA_ARCH__
# makes the shared headers compile their device branches (the code a GPU runs); 800 is the lowest arch the
# real build targets. The __CUDA_NO_* macros are the ones torch's CUDA builds pass.
CU_PROLOGUE = """\
#define __CUDACC__ 1
#define __CUDA_ARCH__ 800
#define __CUDA_NO_HALF_OPERATORS__ 1
#define __CUDA_NO_HALF_CONVERSIONS__ 1
#define __CUDA_NO_HALF2_OPERATORS__ 1
#define __CUDA_NO_BFLOAT16_CONVERSIONS__ 1
#include <cuda_runtime.h>
"""

SIM_LIBRARY = "rlkernels_sim"
BINDING_REGISTRATION = re.compile(r"TORCH_LIBRARY_IMPL\(\s*rlkernels\s*,\s*CUDA\s*,\s*(\w+)\s*\)")
OP_IMPL = re.compile(r'\.impl\(\s*"(\w+)"')


class RewriteError(ValueError):
    pass


def mask_comments_and_strings(src: str) -> str:
    """`src` with the contents of comments, string and character literals blanked (newlines kept), so that
    the searches below see code only and positions stay valid in `src`."""
    out = list(src)
    i, n = 0, len(src)
    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif src[i] in "\"'":
            q, j = src[i], i + 1
            while j < n and src[j] != q:
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            for k in range(i + 1, j - 1):
                if out[k] != "\n":
                    out[k] = " "
            i = j
            continue
        else:
            i += 1
            continue
        for k in range(i, j):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)


def _match_forward(code: str, i: int, open_: str, close: str) -> int:
    """Index just past the bracket that closes code[i] == open_."""
    depth = 0
    for j in range(i, len(code)):
        if code[j] == open_:
            depth += 1
        elif code[j] == close:
            depth -= 1
            if depth == 0:
                return j + 1
    raise RewriteError(f"unbalanced {open_!r} at offset {i}")


def _callee_start(code: str, end: int) -> int:
    """Start of the kernel expression `name<args>` (or `ns::name`) that ends just before `end`."""
    j = end
    while j > 0 and code[j - 1].isspace():
        j -= 1
    if j > 0 and code[j - 1] == ">":  # template arguments, matched backwards
        depth = 0
        while j > 0:
            j -= 1
            if code[j] == ">":
                depth += 1
            elif code[j] == "<":
                depth -= 1
                if depth == 0:
                    break
        while j > 0 and code[j - 1].isspace():
            j -= 1
    k = j
    while k > 0 and (code[k - 1].isalnum() or code[k - 1] in "_:"):
        k -= 1
    if k == j:
        raise RewriteError(f"no kernel name before <<< at offset {end}")
    return k


def _split_top_level(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def rewrite_launches(src: str, filename: str) -> str:
    code = mask_comments_and_strings(src)
    edits = []  # (start, end, replacement)
    for m in re.finditer(r"<<<", code):
        start = _callee_start(code, m.start())
        close = code.find(">>>", m.end())
        if close < 0:
            raise RewriteError(f"{filename}: <<< without >>>")
        cfg = [_one_line(part) for part in _split_top_level(src[m.end() : close])]
        if not 2 <= len(cfg) <= 4 or not all(cfg):
            raise RewriteError(f"{filename}: launch configuration {src[m.end() : close]!r}")
        cfg += ["0", "nullptr"][len(cfg) - 2 :]  # CUDA's defaults: no dynamic shared memory, stream 0
        paren = close + 3
        while code[paren].isspace():
            paren += 1
        if code[paren] != "(":
            raise RewriteError(f"{filename}: no argument list after >>>")
        end = _match_forward(code, paren, "(", ")")
        callee = _one_line(src[start : m.start()])
        args = src[paren + 1 : end - 1]
        line = src.count("\n", 0, m.start()) + 1
        new = (
            f'::rlk_sim::launch("{callee}", "{filename}:{line}", &{callee}, '
            f"dim3({cfg[0]}), dim3({cfg[1]}), {cfg[2]}, {cfg[3]}"
            + (f", {args}" if args.strip() else "")
            + ")"
        )
        lost = src.count("\n", start, end) - new.count("\n")
        edits.append((start, end, new + "\n" * lost))
    return _apply(src, edits)


SHARED = re.compile(
    r"(?P<extern>\bextern\s+)?\b__shared__\s+(?P<type>[^;=\n]+?)\s+(?P<name>\w+)\s*(?P<dims>(?:\[[^\]\n]*\]\s*)*);"
)


def rewrite_shared(src: str, filename: str) -> str:
    code = mask_comments_and_strings(src)
    edits = []
    for m in SHARED.finditer(code):
        type_, name, dims = m["type"].strip(), m["name"], re.sub(r"\s+", "", m["dims"])
        if m["extern"]:
            if dims != "[]":
                raise RewriteError(f"{filename}: extern __shared__ {name} must be an unsized array")
            new = f"{type_}* {name} = ::rlk_sim::dynamic_shared_as<{type_}>();"
        else:
            if "[]" in dims:
                raise RewriteError(f"{filename}: __shared__ {name} has an unsized dimension")
            tag = f"rlk_sim_tag_{name}"
            new = f"static char {tag}; auto& {name} = ::rlk_sim::block_shared_as<{type_}{dims}>(&{tag});"
        edits.append((m.start(), m.end(), new))
    return _apply(src, edits)


def _apply(src: str, edits) -> str:
    out, pos = [], 0
    for start, end, new in sorted(edits):
        out.append(src[pos:start])
        out.append(new)
        pos = end
    out.append(src[pos:])
    return "".join(out)


def rewrite_cuda_source(src: str, path: str, *, prologue: bool) -> str:
    """A .cu (prologue=True) or .cuh / .h of csrc/cuda ready for g++."""
    name = path.rsplit("/", 1)[-1]
    body = rewrite_shared(rewrite_launches(src, name), name)
    return f'{CU_PROLOGUE if prologue else ""}#line 1 "{path}"\n{body}'


def rewrite_binding(src: str, path: str) -> tuple[str, list[str]]:
    """A *_binding.cpp registering into the sim's library on the CPU key, and the ops it implements."""
    found = BINDING_REGISTRATION.findall(src)
    if len(found) != 1:
        raise RewriteError(f"{path}: expected one TORCH_LIBRARY_IMPL(rlkernels, CUDA, m), found {len(found)}")
    body = BINDING_REGISTRATION.sub(lambda m: f"TORCH_LIBRARY_IMPL({SIM_LIBRARY}, CPU, {m[1]})", src)
    ops = OP_IMPL.findall(src[BINDING_REGISTRATION.search(src).start() :])
    if not ops:
        raise RewriteError(f'{path}: no m.impl("...") in its TORCH_LIBRARY_IMPL block')
    return f'#line 1 "{path}"\n{body}', ops
