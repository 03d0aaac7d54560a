"""``make bench-scripts`` runs Horovod's own examples with the README's change and nothing else: the
change applies to the vendored scripts, and each changed script differs from Horovod's in those lines
(Keras 3: first what Keras 3 needs of Horovod's script, Synchronous included)."""
import difflib

import pytest

from horovod_hetero_lab.benchmarks import scripts


def diff(original, changed):
    return [line for line in difflib.unified_diff(original.splitlines(), changed.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def example(name):
    return scripts.original(name)


def test_the_readme_change_is_the_whole_diff():
    original = example("pytorch_mnist.py")
    changed = scripts.torch_script(original, "esync")
    compile(changed, "pytorch_mnist.py", "exec")
    assert diff(original, changed) == [
        "+import horovod_hetero.torch as hh",
        "+        optimizer.sync_model()",
        "+        optimizer.sync_model()",
        "-    train_sampler = torch.utils.data.distributed.DistributedSampler(",
        "-        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())",
        "+    train_sampler = hh.DistributedSampler(",
        "+        train_dataset, num_replicas=hvd.size(), rank=hvd.rank(), loader_batch_size=args.batch_size)",
        "-    optimizer = hvd.DistributedOptimizer(optimizer,",
        "+    optimizer = hh.DistributedOptimizer(optimizer,",
        "+                                         named_buffers=model.named_buffers(), strategy=hh.ESync(),",
    ]


SCALED = [
    "-    dataset = dataset.repeat().shuffle(10000).batch(128)",
    "+    dataset = dataset.repeat().shuffle(10000).batch(32)",
]
FIT = [
    "-    mnist_model.fit(dataset, steps_per_epoch=500 // hvd.size(), callbacks=callbacks, epochs=24, verbose=verbose)",
    "+    mnist_model.fit(dataset, steps_per_epoch=200 // hvd.size(), callbacks=callbacks, epochs=4, verbose=verbose)",
]


def test_the_keras_3_change_is_the_port_and_the_one_callback():
    original = example("tensorflow2_keras_mnist.py")
    changed = scripts.keras_script(original, "esync", "tensorflow", 4)
    compile(changed, "tensorflow2_keras_mnist.py", "exec")
    assert diff(original, changed) == ["+import horovod_hetero.keras as hh"] + SCALED + [
        "-    opt = hvd.DistributedOptimizer(",                                  # the callback averages the models
        "-        opt, backward_passes_per_step=1, average_aggregated_gradients=True)",
        "-                        metrics=['accuracy'],",                       # Keras 3's compile has no such option
        "-                        experimental_run_tf_function=False)",
        "+                        metrics=['accuracy'])",
        "-        hvd.callbacks.BroadcastGlobalVariablesCallback(0),",          # Horovod's fail on Keras 3
        "+        hh.callbacks.BroadcastGlobalVariablesCallback(0),",
        "+        hh.callbacks.ESyncCallback(),",                               # the README's one line
        "-        hvd.callbacks.MetricAverageCallback(),",
        "+        hh.callbacks.MetricAverageCallback(),",
        "-        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),",
        "+        hh.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),",
    ] + FIT


def test_keras_2_synchronous_is_horovods_script_with_hh_callbacks_under_the_same_slowdown():
    original = example("tensorflow2_keras_mnist.py")
    changed = scripts.keras_script(original, "sync", "keras2", 4)
    assert diff(original, changed) == ["+import horovod_hetero.keras as hh"] + SCALED + [
        "-        hvd.callbacks.BroadcastGlobalVariablesCallback(0),",          # Horovod's use Keras 3's package
        "+        hh.callbacks.BroadcastGlobalVariablesCallback(0),",
        "+        hh.callbacks.SlowdownCallback(),",
        "-        hvd.callbacks.MetricAverageCallback(),",
        "+        hh.callbacks.MetricAverageCallback(),",
        "-        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),",
        "+        hh.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=3, verbose=1),",
    ] + FIT
    strategy = scripts.keras_script(original, "esync", "keras2", 4)
    assert "opt = hvd.DistributedOptimizer(" not in strategy and "hh.callbacks.ESyncCallback()," in strategy
    torch = scripts.keras_script(original, "sync", "torch", 4)
    assert "import horovod.torch as hvd\n" in torch and "opt = hh.DistributedOptimizer(" in torch


def test_an_example_that_moved_on_is_named():
    with pytest.raises(ValueError, match="the example no longer has exactly one 'import horovod.torch as hvd'"):
        scripts.torch_script("import torch\n", "esync")
    with pytest.raises(ValueError, match="the example no longer has 3 'hvd.callbacks.'"):
        scripts.keras_script(example("tensorflow2_keras_mnist.py").replace("hvd.callbacks.Metric", "M"),
                             "esync", "tensorflow", 4)
