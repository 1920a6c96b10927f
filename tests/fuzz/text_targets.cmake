tsr_add_fuzz_target(tokenizer fuzz_tokenizer.c)
tsr_add_fuzz_target(template fuzz_template.c)
# The template target's line may have been lost in a concurrent edit of this file (tokenizer helper): register it at
# the end of this folder unless a line in this file already did. Remove this block once the template line is back.
function(tsr_text_fuzz_template_once)
  if(NOT TARGET fuzz_template AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_template.c)
    tsr_add_fuzz_target(template fuzz_template.c)
  endif()
endfunction()
cmake_language(DEFER CALL tsr_text_fuzz_template_once)
