# build/lib/base.sh -- the "before" of a before/after run (sourced by
# build/compare and build/bench/callcost.sh; build/hosts can use it too).
#
# base_checkout ROOT REV DIR LOG: check REV of the repository at ROOT out as
# a detached git worktree at DIR (replacing one left there), and set
# BASE_SHA to the commit. Returns non-zero, with git's words in LOG, when
# REV is no commit or the checkout fails. The caller removes the worktree
# with base_remove ROOT DIR (on exit: an EXIT trap).
base_checkout() {
	local root=$1 rev=$2 dir=$3 log=$4
	BASE_SHA=$(cd "$root" && git rev-parse --verify --quiet "$rev^{commit}") || {
		echo "$rev is not a commit of $root" > "$log"; return 1; }
	(cd "$root" && { git worktree remove --force "$dir" 2> /dev/null || true; rm -rf "$dir"; git worktree prune;
		git worktree add --detach "$dir" "$BASE_SHA"; }) > "$log" 2>&1
}

base_remove() {
	(cd "$1" && git worktree remove --force "$2" && git worktree prune) > /dev/null 2>&1
}
