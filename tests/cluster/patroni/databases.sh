#!/bin/sh
# Patroni's post_bootstrap (once, on the node that initialised the cluster,
# after Patroni made its own superuser and replication roles): pacpriv's
# role and databases. $1: a superuser connection string.
set -eu
psql -v ON_ERROR_STOP=1 "$1" \
  -c "CREATE ROLE pacpriv LOGIN" -c "CREATE DATABASE pacpriv OWNER pacpriv" \
  -c "CREATE DATABASE pacpriv_global OWNER pacpriv"
