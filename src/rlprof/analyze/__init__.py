"""Analysis: reads trace files, never imports torch, the trainer or collect.

The package is also the front door: `rlprof.analyze(path, workers=None, use_ray=False, top=50, by_shape=False)`
returns an `Analysis` (analyze/result.py), analysis.json as typed values.
"""

import sys
import types


class _CallablePackage(types.ModuleType):
    # `rlprof.analyze` is this package once anything imports a module of it, so the front door a notebook calls
    # by that name is the package itself, called.
    def __call__(self, path, **options):
        from .result import analyze

        return analyze(path, **options)


sys.modules[__name__].__class__ = _CallablePackage
