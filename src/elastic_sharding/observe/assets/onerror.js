window.onerror=function(m,s,l,c){var d=document.documentElement.dataset;d.errors=(d.errors?d.errors+'\n':'')+m+' (line '+l+')';};
