#!/bin/sh
# Stands in for Bazel's coverage tools, which cannot be downloaded offline.
echo "bazel coverage is not available offline: run the tests with 'bazel test'" >&2
exit 1
