"""The counting backend on Apache Spark (docs/SCALE.md): session, backend, report counting."""
