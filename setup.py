"""Package discovery (the metadata is in pyproject.toml): every package under the three source
folders, found rather than listed, so a new subpackage cannot be left out of the wheel."""

from setuptools import find_packages, setup

# Import name -> source folder: the CLI and the zoo live beside the library, in the wheel under it.
PACKAGE_DIR = {"onnxplan": "onnxplan", "onnxplan.cli": "cli", "onnxplan.models": "models"}

setup(
    package_dir=PACKAGE_DIR,
    packages=[f"{name}.{sub}" if sub else name
              for name, folder in PACKAGE_DIR.items()
              for sub in ["", *find_packages(folder)]],
)
