"""Training for Keel: deployed models, parity models (ParM §4.4) and their accuracy (§5.1).

Modules, one per role:

- ``datasets``  the two bundled image datasets, split once with a fixed seed
- ``models``    MLP, LeNet-5, ResNet-18, each with a dataclass config; ``build(arch, **config)``
- ``train``     ``train_deployed``: train a deployed model and put it in the model store
- ``parity``    ``train_parity``: train a parity model for a deployed model (add or concat code)
- ``evaluate``  ``evaluate``: A_a, A_d and A_o(f) of a parity model, with a plot
- ``recommender``, ``text_classifier`` (+ ``text_container``), ``localizer``: the seeds'
  workloads as models with signatures (named inputs and outputs, bytes, variable lengths),
  ``keel train recommender | text-classifier | localizer`` (``workloads``); ``named``
  holds what they share (``Star``, ``add_scripted``)
- ``cli``       ``keel train ...`` and ``keel evaluate ...``

The erasure code itself (encoders, decoder) is ``common.erasure``, shared with serving.

Example
-------
>>> from keel.training.train import train_deployed                    # doctest: +SKIP
>>> from keel.training.parity import train_parity                     # doctest: +SKIP
>>> from keel.training.evaluate import evaluate                       # doctest: +SKIP
>>> train_deployed("mnist5k", "mlp", epochs=20, seed=0, store_root="store")   # doctest: +SKIP
>>> train_parity("mnist5k-mlp", k=2, encoder="add", epochs=200, seed=0, store_root="store")  # doctest: +SKIP
>>> evaluate("mnist5k-mlp-parity-k2-add", store_root="store")["A_d"]           # doctest: +SKIP
"""
