// Package builders builds the objects tests feed the agent: Kubernetes
// Services, EndpointSlices and Nodes as the API server stores them, and the
// model's ServicePorts and endpoints for tests that start below the
// translator. Each builder returns a typical object, changed by functional
// options in order (the STYLE.md habit: Service(ns, name, func(*v1.Service))).
//
// It imports nothing of the agent but the model, so that the translator's
// own tests (package k8swatch) can use it. It is test infrastructure:
// production packages never import it.
package builders
