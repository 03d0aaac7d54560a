"""Backend-agnostic logic of the Keras callbacks (as Horovod's ``horovod/_keras``)."""
