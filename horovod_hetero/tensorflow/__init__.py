"""TensorFlow adapters of horovod-hetero (Keras: ``horovod_hetero.tensorflow.keras``)."""
