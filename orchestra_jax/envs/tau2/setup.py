"""Importing tau2-bench: its data folder, no network at import, a clear error when absent.

tau2 (`orchestra_jax[tau2]`, installed from its source as its README says)
reads its data folder from `TAU2_DATA_DIR` once, when first imported, and its
user simulator goes through litellm, which fetches a model price map from the
internet at import unless `LITELLM_LOCAL_MODEL_COST_MAP` is set. `import_tau2`
sets both before the first import and checks them after.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

INSTALL_HINT = (
    "τ²-bench is not installed. Install tau2's dependencies and tau2 itself as "
    "../shared/tau2-bench/README.md says:\n"
    '  pip install -e ".[tau2]"   # tau2\'s dependencies (binary wheels)\n'
    "  pip install --no-deps --ignore-requires-python ../shared/tau2-bench"
)
DATA_DIR_VARIABLE = "TAU2_DATA_DIR"


def tau2_installed() -> bool:
    """Whether tau2 can be imported (checked without importing it)."""
    return importlib.util.find_spec("tau2") is not None


def import_tau2(data_dir: str | os.PathLike | None = None) -> ModuleType:
    """Imports tau2 with its data in `data_dir` (default: `$TAU2_DATA_DIR`).

    Raises ImportError naming the install line when tau2 is missing, and
    ValueError when no data folder is given or tau2 was already imported with
    another one (tau2 reads it once per process).
    """
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no price-map download
    wanted = os.path.abspath(data_dir) if data_dir else os.environ.get(DATA_DIR_VARIABLE)
    if not wanted:
        raise ValueError(
            f"τ²-bench needs its data folder: set env.tau2.data_dir or ${DATA_DIR_VARIABLE} "
            "(e.g. ../shared/tau2-bench/data)"
        )
    if not os.path.isdir(os.path.join(wanted, "tau2", "domains")):
        raise ValueError(f"{wanted} is not a τ²-bench data folder (no tau2/domains inside)")
    if "tau2.utils.utils" not in sys.modules:
        os.environ[DATA_DIR_VARIABLE] = wanted
    try:
        _quiet_logs()
        import tau2  # noqa: F401
        from tau2.utils import utils as tau2_utils
    except ImportError as e:
        raise ImportError(f"{INSTALL_HINT}\n({type(e).__name__}: {e})") from None
    if os.path.abspath(tau2_utils.DATA_DIR) != os.path.abspath(wanted):
        raise ValueError(
            f"tau2 was imported with data folder {tau2_utils.DATA_DIR}, not {wanted}: "
            f"tau2 reads ${DATA_DIR_VARIABLE} once per process"
        )
    return tau2


def _quiet_logs() -> None:
    """tau2 logs every tool call and message at DEBUG through loguru (its default
    sink): warnings and worse only."""
    from loguru import logger

    if not getattr(_quiet_logs, "done", False):
        logger.remove()
        logger.add(sys.stderr, level="WARNING")
        _quiet_logs.done = True  # type: ignore[attr-defined]
