package builders

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// WriteManifest writes objs as the YAML documents of file name in dir, the
// agent's manifests directory (--manifests). The file is written beside
// under a hidden name and renamed, so that an agent reading the directory
// never sees half of it.
func WriteManifest(dir, name string, objs ...runtime.Object) error {
	var b bytes.Buffer
	for i, o := range objs {
		y, err := yaml.Marshal(o)
		if err != nil {
			return fmt.Errorf("manifest %s: %w", name, err)
		}
		if i > 0 {
			b.WriteString("---\n")
		}
		b.Write(y)
	}
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, b.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, name))
}
