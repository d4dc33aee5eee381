/*
Copyright 2025 The kcp Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package plugins

import (
	"k8s.io/apiserver/pkg/admission"

	"github.com/kcp-dev/virtual-workspace-framework/pkg/admission/mutatingwebhook"
	"github.com/kcp-dev/virtual-workspace-framework/pkg/admission/validatingwebhook"
)

// AllOrderedPlugins is the list of all the plugins in order.
var AllOrderedPlugins = []string{
	mutatingwebhook.PluginName,
	validatingwebhook.PluginName,
}

// RegisterAllVWAdmissionPlugins registers all admission plugins.
// The order of registration is irrelevant, see AllOrderedPlugins for execution order.
func RegisterAllVWAdmissionPlugins(plugins *admission.Plugins) {
	mutatingwebhook.Register(plugins)
	validatingwebhook.Register(plugins)
}
