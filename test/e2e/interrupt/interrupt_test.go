package interrupt

import (
	"slices"
	"testing"
)

func TestRunAll(t *testing.T) {
	tests := []struct {
		name       string
		register   []string
		unregister []string
		want       []string
	}{
		{name: "newest first, like t.Cleanup", register: []string{"etcd", "apiserver", "netns"}, want: []string{"netns", "apiserver", "etcd"}},
		{name: "an unregistered cleanup does not run", register: []string{"etcd", "apiserver"}, unregister: []string{"etcd"}, want: []string{"apiserver"}},
		{name: "nothing registered", want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ran []string
			unregs := map[string]func(){}
			for _, name := range tt.register {
				unregs[name] = Register(func() { ran = append(ran, name) })
			}
			for _, name := range tt.unregister {
				unregs[name]()
			}
			RunAll()
			if !slices.Equal(ran, tt.want) {
				t.Errorf("ran %v, want %v", ran, tt.want)
			}
			RunAll()
			if !slices.Equal(ran, tt.want) {
				t.Errorf("second RunAll ran cleanups again: %v", ran)
			}
		})
	}
}
