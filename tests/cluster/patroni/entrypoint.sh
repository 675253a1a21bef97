#!/bin/sh
# A Patroni-managed PostgreSQL node: its name is $PATRONI_NAME (its
# Compose service); it advertises $PATRONI_IP — its address on the
# consensus/replication network only, so cutting that network cuts
# replication and consensus together.
set -eu
export PATRONI_RESTAPI_CONNECT_ADDRESS="${PATRONI_IP}:8008"
export PATRONI_POSTGRESQL_CONNECT_ADDRESS="${PATRONI_IP}:5432"
exec patroni /etc/patroni/patroni.yml
