from elastic_sharding.cli import entry

entry()
