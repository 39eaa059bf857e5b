"""The project is described in pyproject.toml; this file lets tools that still call setup.py install it."""

from setuptools import setup

setup()
