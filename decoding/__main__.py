from decoding.cli import entry

entry()
