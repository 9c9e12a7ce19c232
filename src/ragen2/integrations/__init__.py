"""ragen2's diagnostics inside other trainers: ``ragen2.integrations.trl`` for TRL's ``GRPOTrainer``.

Each integration is imported by its own name, so that importing ragen2 never imports another trainer.
"""
