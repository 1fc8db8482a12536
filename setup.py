"""Installs the package: large-cohort training, AdaBest and GeL on TFF."""

import setuptools

setuptools.setup(
    name='fl-papers-tff',
    version='0.1.0',
    description=(
        'Reproductions of large-cohort training, AdaBest and GeL on'
        ' TensorFlow Federated.'
    ),
    python_requires='>=3.11,<3.12',
    packages=setuptools.find_packages(include=[
        'experiment_driver*', 'tasks*', 'large_cohort*', 'adabest_tff*',
        'gel_tff*', 'fl_common*', 'bench*',
    ]),
    py_modules=['run_experiment'],
    # Exact versions live in requirements/lock.txt; TFF 0.87.0 must be
    # installed with --no-deps because its jax==0.4.14 pin cannot be met.
    install_requires=[
        'absl-py>=1.0,<2',
        'dm-tree~=0.1.8',
        'numpy~=1.25',
        'pandas~=2.1.0',
        'scikit-learn>=1.3',
        'matplotlib~=3.8.0',
        'tensorboard~=2.14.0',  # experiment_driver.outputs writes with it
        'tensorflow==2.14.1',
        'tensorflow-datasets==4.9.3',
    ],
    entry_points={
        'console_scripts': ['fl-run-experiment=run_experiment:entry_point'],
    },
)
