"""The JetStream store: several gateways as one broker over NATS (docs/CLUSTER.md, CL1-CL4)."""
