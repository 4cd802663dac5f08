"""The reconciler's activities (docs/contract.md, "Reconciler"): the pass
(`reconciler`), its verdict on a turn whose run ended (`verdict`; from the run's
history: `history_read`), the runs no open turn leads to (`run_sweep`), runs whose
workflow task keeps failing (`wedged_runs`), and the deletion of passes that found
nothing (`quiet_passes`)."""
