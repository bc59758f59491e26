package server

// AnswersRecycled counts the answer buffers the writers took back.
func AnswersRecycled() int64 { return answersRecycled.Load() }
