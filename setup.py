from setuptools import find_packages, setup

setup(
    name="horovod-hetero",
    version="0.1.0",
    description="Heterogeneity-aware synchronisation strategies (local SGD, ESync, WAGMA, ...) for Horovod",
    packages=find_packages(include=["horovod_hetero", "horovod_hetero.*"]),
    python_requires=">=3.9",
    install_requires=["numpy", "click>=8"],
    extras_require={"torch": ["torch"], "tensorflow": ["tensorflow"], "demo": ["scikit-learn"]},
    entry_points={"console_scripts": ["horovod-hetero=horovod_hetero.cli:main"]},
)
