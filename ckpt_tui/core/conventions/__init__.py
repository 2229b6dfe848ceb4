"""What training code leaves in a checkpoint: key layouts, state_dicts, training state, findings."""
