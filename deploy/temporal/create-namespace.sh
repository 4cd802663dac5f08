#!/bin/sh
# Creates the namespace turnkeeper runs in and registers turnkeeper's search
# attributes in it (docker-compose.yml's temporal-namespace job; the workers, the
# web page and the UI start once it succeeded). Idempotent: an existing namespace
# and attributes already registered with the same type are left as they are.
#
# The worker registers missing attributes itself at start, too; doing it here
# first means workers that start together find them in place, and the
# reconciler's first pass can list by ReconcileOutcome.
set -eu

: "${TEMPORAL_ADDRESS:?}"
: "${TEMPORAL_NAMESPACE:?}"

# The namespace registry refreshes every few seconds: a call right after the
# server comes up, or right after the namespace is created, may not see it yet.
retry() {
	attempt=1
	until "$@"; do
		if [ "$attempt" -ge 30 ]; then
			echo "temporal-namespace: gave up after $attempt attempts: $*" >&2
			return 1
		fi
		attempt=$((attempt + 1))
		sleep 2
	done
}

retry temporal operator cluster health --address "$TEMPORAL_ADDRESS"

if ! temporal operator namespace describe --namespace "$TEMPORAL_NAMESPACE" \
	--address "$TEMPORAL_ADDRESS" >/dev/null 2>&1; then
	retry temporal operator namespace create --namespace "$TEMPORAL_NAMESPACE" \
		--address "$TEMPORAL_ADDRESS"
fi

# turnkeeper's search attributes (turnkeeper/dev_server.py, SEARCH_ATTRIBUTES),
# all Keyword; tests/unit/test_compose.py keeps this list in step with it.
retry temporal operator search-attribute create --namespace "$TEMPORAL_NAMESPACE" \
	--address "$TEMPORAL_ADDRESS" \
	--name ChatId --type Keyword \
	--name TurnStatus --type Keyword \
	--name RecoveryReason --type Keyword \
	--name ReconcileOutcome --type Keyword

echo "temporal-namespace: namespace $TEMPORAL_NAMESPACE is ready"
