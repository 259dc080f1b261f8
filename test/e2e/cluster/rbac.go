package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
)

// BindDeployedRole creates the ClusterRole of deploy/rbac.yaml, exactly as
// shipped, and binds it to user (one of Options.Users), who then has the
// rights the agent's DaemonSet gives it and no others. It returns the role.
func BindDeployedRole(ctx context.Context, admin kubernetes.Interface, user string) (*rbacv1.ClusterRole, error) {
	role, err := DeployedClusterRole()
	if err != nil {
		return nil, err
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name + "-" + user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	return role, nil
}

// DeployedClusterRole reads the ClusterRole from deploy/rbac.yaml.
func DeployedClusterRole() (*rbacv1.ClusterRole, error) {
	_, file, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(file), "..", "..", "..", "deploy", "rbac.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var doc json.RawMessage
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		var meta metav1.TypeMeta
		if err := json.Unmarshal(doc, &meta); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if meta.Kind != "ClusterRole" {
			continue
		}
		var role rbacv1.ClusterRole
		if err := json.Unmarshal(doc, &role); err != nil {
			return nil, fmt.Errorf("%s: ClusterRole: %w", path, err)
		}
		return &role, nil
	}
	return nil, fmt.Errorf("%s has no ClusterRole", path)
}
