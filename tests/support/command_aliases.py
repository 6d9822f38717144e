"""The training aliases tests/cli/test_commands.py runs through the installed ``lightning-hybrid`` command
(tests/repository/test_doc_commands.py leaves the pages' commands that are just these to it)."""

ALIASES = ("ddp", "ssp_delay", "ssp_async", "ssp_bounded", "balanced", "delayed_averaging", "delayed_averaging_dc", "local_sgd",
           "cneural", "hybrid")
