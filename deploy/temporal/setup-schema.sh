#!/bin/sh
# Creates Temporal's two databases on first start and migrates their schema to
# the version of the admin-tools image that runs this (docker-compose.yml's
# temporal-schema job; the server starts only once it succeeded). Every step is
# idempotent, so the job runs on each `docker compose up`.
#
# temporal-sql-tool reads the connection from SQL_PLUGIN, SQL_HOST, SQL_PORT,
# SQL_USER and SQL_PASSWORD.
set -eu

SCHEMA=/etc/temporal/schema/postgresql/v12

migrate() {
	database=$1
	versioned=$2
	temporal-sql-tool --db "$database" create-database
	# Only the version tables: update-schema below brings every versioned step.
	temporal-sql-tool --db "$database" setup-schema -v 0.0
	temporal-sql-tool --db "$database" update-schema -d "$SCHEMA/$versioned/versioned"
}

# The server's default database names (DBNAME, VISIBILITY_DBNAME unset).
migrate temporal temporal
migrate temporal_visibility visibility
echo "temporal-schema: temporal and temporal_visibility are at the image's schema version"
