"""Runnable examples, shipped with the package (``horovod-hetero demo`` runs ``torch_digits``)::

    horovodrun -np 4 -H localhost:4 --gloo python -m horovod_hetero.examples.torch_digits --strategy esync
    horovodrun -np 4 -H localhost:4 --gloo python -m horovod_hetero.examples.keras_digits --strategy localsgd
"""
