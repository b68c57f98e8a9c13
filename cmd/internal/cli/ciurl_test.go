package cli

import (
	"strings"
	"testing"
)

// TestCIURL: the job's URL from the CI's own variables, in the order of
// docs/leases.md §2.1 item 11; nothing when none is set or the value could
// not be recorded (control characters, too long).
func TestCIURL(t *testing.T) {
	cases := []struct {
		env  map[string]string
		want string
	}{
		{nil, ""},
		{map[string]string{"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "o/r", "GITHUB_RUN_ID": "7", "CI_JOB_URL": "https://gitlab/j/1"},
			"https://github.com/o/r/actions/runs/7"},
		{map[string]string{"GITHUB_REPOSITORY": "o/r", "GITHUB_RUN_ID": "7"}, "https://github.com/o/r/actions/runs/7"},
		{map[string]string{"GITHUB_SERVER_URL": "https://ghe.example/", "GITHUB_REPOSITORY": "o/r", "GITHUB_RUN_ID": "7"}, "https://ghe.example/o/r/actions/runs/7"},
		{map[string]string{"GITHUB_RUN_ID": "7", "CI_JOB_URL": "https://gitlab/j/1"}, "https://gitlab/j/1"}, // no repository: not a GitHub run's URL
		{map[string]string{"CI_JOB_URL": "https://gitlab/j/1", "BUILDKITE_BUILD_URL": "https://bk/b/2", "BUILD_URL": "https://jenkins/3"}, "https://gitlab/j/1"},
		{map[string]string{"BUILDKITE_BUILD_URL": "https://bk/b/2", "BUILD_URL": "https://jenkins/3"}, "https://bk/b/2"},
		{map[string]string{"BUILD_URL": "https://jenkins/3"}, "https://jenkins/3"},
		{map[string]string{"BUILD_URL": "https://jenkins/3\n\x1b[2J"}, ""},
		{map[string]string{"BUILD_URL": "https://jenkins/" + strings.Repeat("a", 2048)}, ""},
	}
	for _, c := range cases {
		if got := ciURL(func(k string) string { return c.env[k] }); got != c.want {
			t.Errorf("ciURL(%v) = %q, want %q", c.env, got, c.want)
		}
	}
}
