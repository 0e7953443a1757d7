"""The pure part of the JetStream store: names, keys and configurations (docs/CLUSTER.md)."""
