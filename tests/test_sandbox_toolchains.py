"""Which host files the sandboxes show: the toolchains' own, found on this machine."""

from __future__ import annotations

import os

import pytest

from genesys.sandbox.toolchains import _other_libraries_headers


def test_header_directories_the_compiler_uses_are_never_hidden() -> None:
    # Some distributions print include paths as /usr/lib/gcc/<triple>/<N>/../../../../include/c++/<N>.
    versions = sorted(os.listdir("/usr/include/c++")) if os.path.isdir("/usr/include/c++") else []
    if not versions:
        pytest.skip("no C++ headers under /usr/include/c++ on this machine")
    unnormalised = f"/usr/lib/gcc/x86_64-linux-gnu/{versions[-1]}/../../../../include/c++/{versions[-1]}"
    hidden = _other_libraries_headers(["/usr/include", unnormalised])
    assert "c++" not in hidden
    for keep in ("sys", "bits", "linux"):
        assert keep not in hidden
