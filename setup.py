import os
from setuptools import setup, find_packages

setup(
    name="sglang-vradix",
    version="0.1.0",
    package_dir={"": "python"},
    packages=find_packages("python"),
    entry_points={"sglang.srt.plugins": ["vradix = vradix.plugin:register"]},
    install_requires=["sglang==0.5.23", "torch==2.14.1"],
    python_requires=">=3.10",
)
