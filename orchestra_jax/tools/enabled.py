"""`tools.enabled`: the tools every task offers, by name or by import path.

    "search,enhance_reasoning,answer"           the paper's meta-tools (the default)
    "search,enhance_reasoning,answer,python"    plus the sandboxed Python tool
    "search,answer,my_lab.tools:lookup"         a tool from one's own module

An import path names a `function_tools.FunctionTool` (registered as a plain tool
under its own name) or a `meta_tool_table.MetaToolSpec` (registered as a
meta-tool); either then appears under its name in `ToolConfig.tools`.
"""

from __future__ import annotations

from orchestra_jax.registry import import_object, is_import_path
from orchestra_jax.tools.function_tools import PLAIN_TOOLS, FunctionTool, register_tool
from orchestra_jax.tools.meta_tool_table import META_TOOLS, MetaToolSpec, is_meta_tool


def _register(path: str) -> str:
    """Registers the tool at import path `path` (once); returns its name."""
    obj = import_object(path)
    if isinstance(obj, MetaToolSpec):
        if obj.name not in META_TOOLS:
            META_TOOLS.register(obj.name, obj)
        elif META_TOOLS.get(obj.name) != obj:
            raise ValueError(f"{path}: another meta-tool is registered as {obj.name!r}")
        return obj.name
    if isinstance(obj, FunctionTool):
        if obj.name not in PLAIN_TOOLS:
            register_tool(obj)
        elif PLAIN_TOOLS.get(obj.name).schema != obj.schema:
            raise ValueError(f"{path}: another tool is registered as {obj.name!r}")
        return obj.name
    raise ValueError(f"{path} is a {type(obj).__name__}, not a FunctionTool or a MetaToolSpec")


def enabled_tools(spec: str) -> tuple[str, ...]:
    """The tool names of a comma-separated `tools.enabled` (see the module docstring).

    Raises ValueError for an unknown name or a bad import path.
    """
    names = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if is_meta_tool(item) or item in PLAIN_TOOLS:
            names.append(item)
        elif is_import_path(item):
            names.append(_register(item))
        else:
            raise ValueError(
                f"unknown tool {item!r}; meta-tools {META_TOOLS.names()}, plain tools "
                f"{PLAIN_TOOLS.names()}, or 'package.module:attr'"
            )
    if not names:
        raise ValueError("no tools enabled")
    if len(set(names)) != len(names):
        raise ValueError(f"a tool is enabled twice: {names}")
    return tuple(names)
