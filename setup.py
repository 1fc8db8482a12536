"""Installs the package: large-cohort training, AdaBest and GeL on TFF."""

import setuptools

setuptools.setup(
    name='fl-papers-tff',
    version='0.1.0',
    description=(
        'Reproductions of large-cohort training, AdaBest and GeL on'
        ' TensorFlow Federated.'
    ),
    python_requires='>=3.11,<3.14',
    # Every package of the repository (a new algorithm family's too), not
    # the tests nor Bazel's output trees.
    packages=setuptools.find_packages(
        exclude=['tests', 'tests.*', 'bazel-*', 'third_party*']),
    py_modules=['run_experiment'],
    # The tested set is requirements/lock.txt, installed by `make install`
    # (requirements/install.sh): TFF 0.87.0 itself cannot be a requirement
    # here, since it declares jax==0.4.14 (wheels gone) and Python < 3.12,
    # and it needs requirements/fix_dependencies.py on this stack.
    install_requires=[
        'absl-py>=2',
        'dm-tree',
        'numpy>=2',
        'pandas>=2.2',
        'scikit-learn>=1.3',
        'matplotlib>=3.8',
        'tensorboard~=2.21.0',  # experiment_driver.outputs writes with it
        'tf-keras~=2.21.0',  # requires `tensorflow`; Keras 2 for TFF
        'tensorflow-datasets>=4.9.10',
        'importlib_resources',
    ],
    extras_require={
        # The CUDA 12 build of the same TensorFlow, for the driver's own
        # TensorFlow (docs/runtime.md says what runs on the GPU).
        'gpu': ['tensorflow[and-cuda]~=2.21.0'],
    },
    entry_points={
        'console_scripts': ['fl-run-experiment=run_experiment:entry_point'],
    },
)
