"""The packages setuptools builds, pyproject.toml holding the rest: ``find`` alone cannot list the config
tree, whose folder (conf/, at the root) is not inside the package it ships in (ragen2.conf). Folders without
an ``__init__.py`` (the organism's warm-start model, the config groups) are packages of data files."""

from setuptools import find_namespace_packages, setup


def packages(where: str, prefix: str = "") -> list[str]:
    return [prefix + p for p in find_namespace_packages(where, exclude=["*__pycache__*"])]


setup(packages=[*packages("src"), *packages("envs"), "ragen2.conf", *packages("conf", "ragen2.conf.")])
