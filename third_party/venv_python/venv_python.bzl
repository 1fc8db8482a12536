"""A Python toolchain running on the workspace's `.venv/bin/python`.

TensorFlow and TFF are installed only in the project's virtualenv (`make
install`), so every `py_binary` and `py_test` must run on its interpreter.
`py_runtime` needs an absolute path; this repository rule finds the workspace
on disk and writes a `py_runtime` for `<workspace>/.venv/bin/python`, so
nothing depends on where the repository is checked out.
"""

_BUILD = """\
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

py_runtime(
    name = "venv_python3",
    interpreter_path = "{python}",
    python_version = "PY3",
    stub_shebang = "#!{python}",
)

py_runtime_pair(
    name = "venv_runtime_pair",
    py3_runtime = ":venv_python3",
)

toolchain(
    name = "python_toolchain",
    toolchain = ":venv_runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
"""

def _venv_python_impl(repository_ctx):
    workspace_dir = repository_ctx.path(Label("//:WORKSPACE")).dirname
    python = workspace_dir.get_child(".venv").get_child("bin").get_child("python")
    if not python.exists:
        fail("%s does not exist: run `make install` first" % python)
    repository_ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % repository_ctx.name)
    repository_ctx.file("BUILD", _BUILD.format(python = python))

venv_python = repository_rule(
    implementation = _venv_python_impl,
    doc = "Defines `:python_toolchain`, running Python on `<workspace>/.venv`.",
)
