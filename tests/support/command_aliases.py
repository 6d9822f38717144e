"""The training aliases tests/cli/test_commands.py runs through the installed ``lightning-hybrid`` command
(tests/repository/test_doc_commands.py leaves the pages' commands that are just these to it)."""

ALIASES = ("ddp", "ssp", "ssp_async", "ssp_bounded", "balanced", "allreduce_asgd", "allreduce_asgd_dc", "local_sgd",
           "cneural", "hybrid")
