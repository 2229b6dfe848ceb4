"""The real ``torch.load(weights_only=True)``, run in a fresh process (``import torch`` and nothing else).

Reads a JSON list of jobs on stdin: ``{"path": ..., "imports": [...], "line": "torch.serialization..."}``
(``imports`` and ``line`` optional). For each job it runs the line, loads the file with
``weights_only=True, map_location="cpu"``, then restores the allowlist. Prints a JSON list of
``{"loads": bool, "error": str}``. Also prints what ``import torch`` allowlists by itself.
"""

from __future__ import annotations

import importlib
import json
import sys
import warnings


def main() -> None:
    """Run every job on stdin."""
    import torch

    warnings.simplefilter("ignore")
    from torch._weights_only_unpickler import _get_allowed_globals, _get_user_allowed_globals

    builtin_allowed = sorted(_get_allowed_globals())
    import_allowed = sorted(_get_user_allowed_globals())
    before = torch.serialization.get_safe_globals()
    results = []
    for job in json.load(sys.stdin):
        namespace = {"torch": torch}
        try:
            for module in job.get("imports", []):
                namespace[module.split(".")[0]] = importlib.import_module(module)
            if job.get("line"):
                exec(job["line"], namespace)  # our own generated line, from the test
            torch.load(job["path"], weights_only=True, map_location="cpu")
            results.append({"loads": True, "error": ""})
        except Exception as exc:  # the verdict is the exception's existence
            results.append({"loads": False, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())[-300:]}"})
        finally:
            torch.serialization.clear_safe_globals()
            torch.serialization.add_safe_globals(before)
    json.dump({"results": results, "allowed": builtin_allowed, "import_allowed": import_allowed}, sys.stdout)


if __name__ == "__main__":
    main()
