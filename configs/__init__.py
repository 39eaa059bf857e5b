"""One config file per model size, each a get_config() with every hyperparameter written out.

Programs load a size file by path (--config=configs/<size>.py[:recipe]); the size files import their
shared defaults as `from configs import common`, which resolves from the repository root or, from any
other directory, through the installed project. The model shape each file writes is held to the one
size table, bertjax.models.config.SIZES, by tests/test_configs.py.
"""
