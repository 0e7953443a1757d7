"""PySpark connector and analyses for the gateway's audit log."""
