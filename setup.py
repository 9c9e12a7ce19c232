"""The packages setuptools builds, pyproject.toml holding the rest: ``find`` alone cannot list the config tree,
whose folder (conf/, at the root) is not inside the package it ships in (ragen2.conf)."""

from setuptools import find_namespace_packages, find_packages, setup

setup(
    packages=[
        *find_packages("src"),
        *find_packages("envs"),
        "ragen2.conf",
        *(f"ragen2.conf.{group}" for group in find_namespace_packages("conf")),
    ]
)
