// Package shadowmqtt is the MQTT face of device shadows (core/shadow): a
// device reads and reports its own shadow on reserved topics, and hears
// the delta when a backend changes what it desires and whenever it
// connects while the delta is not empty.
//
//	device publishes                 gateway answers (to that device only)
//	$shadow/<id>/update {state.reported, version?, client_token?}
//	                                 $shadow/<id>/update/accepted  the new document
//	                                 $shadow/<id>/update/rejected  {code, message, client_token}
//	$shadow/<id>/get                 $shadow/<id>/get/accepted     the document
//	                                 $shadow/<id>/get/rejected     {code, message}
//	                                 $shadow/<id>/update/delta     {state, version, timestamp}
//
// <id> must be the publisher's own client ID (else the publish is refused,
// not authorized); any other topic under $shadow/ is refused (topic name
// invalid). Requests are taken off the bridge (bridge.Interceptor): never
// stored in the core, never delivered to subscribers. Answers and deltas
// are sent point-to-point (engine.Send), whether or not the device
// subscribed, and only when the ACL lets the device read the topic.
//
// A Devices is safe for concurrent use. Start starts its connect workers;
// Close stops them and returns once they ended.
package shadowmqtt
