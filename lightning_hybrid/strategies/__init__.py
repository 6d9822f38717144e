"""Lightning strategies of the suite (Lightning glue only; the algorithms live in their own packages).

Each strategy registers a string alias with Lightning's ``StrategyRegistry`` when this package is
imported (``import lightning_hybrid`` does so). Planned: ``SSPStrategy`` ("ssp"),
``AllReduceASGDStrategy`` ("allreduce_asgd"), ``HybridParallelStrategy`` ("hybrid") and
``PartitionedInferenceStrategy`` ("partitioned_inference"); see the README's table.
"""
