"""Engine integrations, one module per engine; each imports its engine when it is imported (the core never does)."""
