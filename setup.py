"""Ships the top-level registry.yaml inside the installed ``gdnzoo`` package (all other
metadata lives in pyproject.toml)."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithRegistry(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:  # editable installs read it from the checkout
            dst = Path(self.build_lib) / "gdnzoo" / "registry.yaml"
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(__file__).parent / "registry.yaml", dst)


setup(cmdclass={"build_py": BuildPyWithRegistry})
