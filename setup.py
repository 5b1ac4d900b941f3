"""Build script for the one C extension; everything else is declared in pyproject.toml.

``planner.ingest._zmqdrain`` receives FPM messages in batches (see its source). It is optional: where it cannot
be compiled the subscriber falls back to pyzmq's ``recv_multipart`` and says so (``FpmSubscriber.receive_path``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "planner.ingest._zmqdrain",
            ["planner/ingest/_zmqdrain.c"],
            libraries=["dl"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"],
            optional=True,
        )
    ]
)
