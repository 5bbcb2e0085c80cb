"""SavedModels written the way other people and tools write them, with the verdict TF Serving gives each one."""
